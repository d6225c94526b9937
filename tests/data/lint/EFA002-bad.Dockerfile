# the host's install command, copied into a container build
ARG EFA_INSTALLER_VERSION=1.50.0
RUN apt-get update \
 && cd /tmp \
 && curl -fsSL -O https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz \
 && tar -xf aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz \
 && cd aws-efa-installer \
# expect: EFA002 --skip-kmod
# expect: EFA002 --no-verify
 && ./efa_installer.sh -y -g --skip-limit-conf
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}
