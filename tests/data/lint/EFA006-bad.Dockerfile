# "default" plugin name: libnccl-net.so is the InfiniBand plugin in the image
# expect: EFA006
ENV NCCL_NET_PLUGIN=libnccl-net.so
