# expect: EFA012 torch
# expect: EFA012 deepspeed
RUN pip install --no-cache-dir torch deepspeed transformers
