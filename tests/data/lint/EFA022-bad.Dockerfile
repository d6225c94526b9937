# platform: linux/arm64
# expect: EFA022 'https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb' names x86_64 in a layer built for linux/arm64
RUN curl -fsSLO https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb
ARG GDRCOPY_DEB=gdrcopy_2.5.1-1_amd64.Ubuntu24_04.deb
# expect: EFA022 names amd64
RUN dpkg -i /tmp/${GDRCOPY_DEB}
RUN apt-get install -y curl=8.5.0-2ubuntu10.6 \
    # expect: EFA022 names x86_64
    && ln -s /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/local/lib/libcuda.so.1
