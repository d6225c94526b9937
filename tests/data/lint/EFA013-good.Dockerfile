ENV TOKENIZERS_PARALLELISM=false
RUN --mount=type=secret,id=hf_token HF_TOKEN=$(cat /run/secrets/hf_token) huggingface-cli download org/model
