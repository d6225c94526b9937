# platform: linux/arm64
ARG TARGETARCH
# the machine from the build: BuildKit sets TARGETARCH (arm64), uname -m says aarch64
RUN curl -fsSLO "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/$(uname -m | sed s/aarch64/sbsa/)/cuda-keyring_1.1-1_all.deb"
RUN dpkg -i "/tmp/gdrcopy_2.5.1-1_${TARGETARCH}.Ubuntu24_04.deb"
RUN dpkg --add-architecture amd64 && case "$(uname -m)" in x86_64) echo x86_64 ;; aarch64) echo aarch64 ;; esac
RUN ln -s /usr/lib/aarch64-linux-gnu/libcuda.so.1 /usr/local/lib/libcuda.so.1
