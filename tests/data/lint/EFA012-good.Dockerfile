RUN pip install --no-cache-dir deepspeed==0.16.4 transformers numpy
