"""pal_hpc: parallel actors and learners for reinforcement learning on MPI HPC nodes."""

__version__ = "0.1.0"
