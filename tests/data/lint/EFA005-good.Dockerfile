# the NGC Open MPI stays; only libraries that are not MPI are added
RUN apt-get update && apt-get install -y --no-install-recommends libhwloc-dev numactl
ENV PATH=/opt/amazon/efa/bin:${PATH}
