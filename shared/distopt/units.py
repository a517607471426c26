"""Units: the course writes sizes in decimal gigabytes, as the lesson and vendors do."""

KB = 1e3
MB = 1e6
GB = 1e9  # bytes
GIB = 2**30  # bytes; what torch and nvidia-smi report as "GiB"


def gbit_per_s(gigabits: float) -> float:
    """A link speed in Gb/s (how networks are sold) as bytes per second."""
    return gigabits * 1e9 / 8
