# expect: EFA017 curl, git
RUN apt-get update && apt-get install -y --no-install-recommends -o Dpkg::Use-Pty=0 curl=7.88.1-10+deb12u8 curl git \
 && rm -rf /var/lib/apt/lists/*
# expect: EFA017 numactl
RUN apt install -y numactl
