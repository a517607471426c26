"""The course's autograder: nbgrader configuration, grading driver and student self-check."""
