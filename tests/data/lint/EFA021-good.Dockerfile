# platform: linux/arm64
ARG EFA_INSTALLER_VERSION=1.50.0
RUN apt-get update && cd /tmp/aws-efa-installer && ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify
# both triplets' plugin directories, as awsome-distributed-training's nccl-tests image: one ENV for both platforms
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu:/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH}
ENV FI_PROVIDER_PATH=/usr/lib/aarch64-linux-gnu/libfabric
