ENV TORCH_CUDA_ARCH_LIST=10.0
# expect: EFA011
RUN git clone https://github.com/deepseek-ai/DeepEP.git /opt/DeepEP \
 && cd /opt/DeepEP \
 && DISABLE_AGGRESSIVE_PTX_INSTRS=1 pip install --no-build-isolation --no-deps . \
 && rm -rf /opt/DeepEP/build
