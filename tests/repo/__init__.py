"""Tests of the repository: style, pins, what the checks cover, JupyterLab's start-up."""
