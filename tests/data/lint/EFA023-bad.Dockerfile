# platform: linux/arm64
# DeepEP's kernels for A100 and H100's x86_64 hosts only: a Grace node's GPU is neither
# expect: EFA023 TORCH_CUDA_ARCH_LIST='8.0;8.6' names neither 9.0 (GH200) nor 10.0 (GB200)
ENV TORCH_CUDA_ARCH_LIST="8.0;8.6"
RUN pip install --no-build-isolation --no-deps .
