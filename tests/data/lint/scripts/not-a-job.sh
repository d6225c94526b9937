#!/bin/sh
# builds things; runs no Slurm job
export LD_LIBRARY_PATH=/opt/amazon/efa/lib
make -j4
