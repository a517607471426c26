"""Units: the course writes sizes in decimal gigabytes, as the lesson and vendors do."""

KB = 1e3
MB = 1e6
GB = 1e9  # bytes
GIB = 2**30  # bytes; what torch and nvidia-smi report as "GiB"


def gbit_per_s(gigabits: float) -> float:
    """A link speed in Gb/s (how networks are sold) as bytes per second."""
    return gigabits * 1e9 / 8


# The one H100 (SXM, "80GB") memory size of the course. NVIDIA sells it as "80GB", and it has
# 80 GiB of HBM3: five 16 GiB stacks (DRAM is made in binary sizes, so the vendor's "GB" here is a
# GiB; torch.cuda reports total_memory = 79.1 GiB after the driver's reserve). The A100 80GB is
# the same 80 GiB. What a model may plan to fill is a fraction of it:
# distopt.costs.memory.USABLE_FRACTION.
H100_MEMORY_BYTES = 80 * GIB  # = 85.9e9 bytes
A100_80GB_MEMORY_BYTES = 80 * GIB
