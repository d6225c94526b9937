# an MPI benchmark built against a second Open MPI on top of NGC's /usr/local/mpi
# expect: EFA005
RUN apt-get update && apt-get install -y --no-install-recommends libopenmpi-dev openmpi-bin
# expect: EFA005
ENV PATH=/opt/amazon/openmpi/bin:${PATH}
