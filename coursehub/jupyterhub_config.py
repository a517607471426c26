"""JupyterHub's configuration for the course server (`make hub` starts the hub with it).

Students are Unix accounts (created by `make hub` when it runs as root), each in a JupyterLab
of their own started by LocalProcessSpawner as that account, with the course's environment
(.venv) and nbgrader's assignment list reading the exchange in coursehub/state/exchange.
The demo logs in with one shared password; coursehub/lti13_config.py is the LTI 1.3 login
of a real deployment, and coursehub/k8s/ the deployment on Kubernetes.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from coursehub import settings  # noqa: E402

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

c.JupyterHub.bind_url = f"http://127.0.0.1:{settings.PORT}"
# three ports of their own (settings.PORTS): the public one, the hub's, the proxy's API
c.JupyterHub.hub_port = settings.HUB_PORT
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.PROXY_API_PORT}"
c.JupyterHub.db_url = f"sqlite:///{settings.STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(settings.STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(settings.STATE / "jupyterhub.pid")
c.ConfigurableHTTPProxy.command = [str(settings.PROXY)]
c.ConfigurableHTTPProxy.pid_file = str(settings.STATE / "proxy.pid")
# the proxy goes down with the hub: no proxy is left behind by `make hub` or a test
c.JupyterHub.cleanup_proxy = True
c.JupyterHub.cleanup_servers = True

# The demo's login: every account below, one shared password. Real courses: lti13_config.py.
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = settings.PASSWORD
c.Authenticator.allowed_users = set(settings.STUDENTS)
# The instructor works from the course checkout (nbgrader's release and collect, make grade:
# coursehub/instructor.py), not from a lab on the hub.

# One JupyterLab per student, as that student's Unix account, on the course's environment.
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [str(settings.STUDENT_PYTHON), "-m", "jupyterhub.singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment = {
    # nbgrader's exchange root and course id for the assignment list (make hub writes it)
    # then the course's .venv's own: its server extensions (nbgrader's) and lab extensions
    "JUPYTER_CONFIG_PATH": f"{settings.STUDENT_CONFIG}:{settings.PYTHON.parent.parent}/etc/jupyter",
    "JUPYTER_PATH": f"{settings.PYTHON.parent.parent}/share/jupyter",
    "OMP_NUM_THREADS": "1",
    "PATH": f"{settings.STUDENT_PYTHON.parent}:/usr/local/bin:/usr/bin:/bin",
}
# A student's server is the memory a class costs: cap what one may use (JupyterLab itself
# takes about 100-150 MB; a notebook's 4-rank torch runs a few hundred MB more).
c.Spawner.mem_limit = os.environ.get("COURSEHUB_MEM_LIMIT", "2G")

# Grading on submit: a service the hub starts, stops and gives an API token.
c.JupyterHub.services = [
    {
        "name": settings.SERVICE_NAME,
        "command": [str(settings.PYTHON), "-m", "coursehub.grading_service"],
        "cwd": str(settings.ROOT),
        "environment": {
            "PYTHONPATH": f"{settings.ROOT}:{settings.HERE.parent}",
            "COURSEHUB_ROOT": str(settings.ROOT),
            "COURSEHUB_STATE": str(settings.STATE),
            "COURSEHUB_MIN_MINUTES": str(settings.MIN_MINUTES),
            "COURSEHUB_STUDENTS": ",".join(settings.STUDENTS),
            "COURSEHUB_JOBS": os.environ.get("COURSEHUB_JOBS", ""),
            "OMP_NUM_THREADS": "1",
            "PATH": f"{settings.PYTHON.parent}:/usr/local/bin:/usr/bin:/bin",
        },
    }
]
# A script that drives the hub (e2e/test_coursehub.py) gets an admin token this way: the
# hub's REST API starts servers and hands each student a token of their own.
ADMIN_TOKEN = os.environ.get("COURSEHUB_ADMIN_TOKEN")
if ADMIN_TOKEN:
    c.JupyterHub.services.append({"name": "course-admin", "api_token": ADMIN_TOKEN})
c.JupyterHub.load_roles = [
    {
        # the service reads who is a user; it needs nothing else from the hub
        "name": "grader-service",
        "scopes": ["list:users", "read:users:name"],
        "services": [settings.SERVICE_NAME],
    }
]
if ADMIN_TOKEN:
    c.JupyterHub.load_roles.append(
        {
            "name": "course-admin",
            "scopes": ["admin:users", "admin:servers", "tokens", "list:users", "access:servers"],
            "services": ["course-admin"],
        }
    )
