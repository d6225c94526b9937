RUN apt-get update && apt-get install -y --no-install-recommends curl=7.88.1-10+deb12u8 git=1:2.39.5-0+deb12u2 \
 && rm -rf /var/lib/apt/lists/*
RUN apt-get install -y ./vendor/tool_1.0_amd64.deb
RUN apt-get update && apt-get upgrade -y --no-install-recommends
