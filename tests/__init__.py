"""The course's tests: one folder per package folder of distopt, plus grader/ and repo/."""
