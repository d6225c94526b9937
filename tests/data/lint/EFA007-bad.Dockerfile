# settings carried over from an InfiniBand cluster
# expect: EFA007 NCCL_IB_HCA
# expect: EFA007 NCCL_NET=IB
ENV NCCL_IB_HCA=mlx5 \
    NCCL_NET=IB
