# platform: linux/arm64
# GB200 (10.0) and GH200 (9.0a: Hopper's arch-specific features), as the guide builds DeepEP for the node's GPU
ENV TORCH_CUDA_ARCH_LIST="9.0a;10.0+PTX"
RUN pip install --no-build-isolation --no-deps .
