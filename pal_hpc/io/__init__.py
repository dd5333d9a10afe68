"""Files a run leaves behind: the HDF5 metrics log, HDF5 checkpoints, offline analysis."""
