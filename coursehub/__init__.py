"""The course server: JupyterHub with nbgrader's exchange, and grading on submit.

`make hub` starts it (:mod:`coursehub.start`); :mod:`coursehub.grading_service` is the hub
service that grades each submission as it arrives. See coursehub/README.md.
"""
