# platform: linux/arm64
ARG EFA_INSTALLER_VERSION=1.50.0
RUN apt-get update && cd /tmp/aws-efa-installer && ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify
# the plugin directory of x86_64 only: an arm64 loader skips it
# expect: EFA021 /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu (x86_64-linux-gnu) but not /opt/amazon/ofi-nccl/lib/aarch64-linux-gnu
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}
# expect: EFA021 FI_PROVIDER_PATH names /usr/lib/x86_64-linux-gnu/libfabric
ENV FI_PROVIDER_PATH=/usr/lib/x86_64-linux-gnu/libfabric
