"""LTI 1.3 login for a real course (not run here): students come from the LMS (Canvas,
Moodle) with their LMS identity, and no password is kept on the hub.

Use it in place of the demo's shared password: copy these lines to the end of
jupyterhub_config.py (they replace its authenticator). Needs jupyterhub-ltiauthenticator (pip
install jupyterhub-ltiauthenticator==1.6.3 into the hub's environment). In the LMS, register a
"LTI 1.3 tool" (Canvas: Developer Keys, LTI Key; Moodle: External tool, LTI 1.3) with

    Target link / redirect URI  https://HUB/hub/lti13/oauth_callback
    OpenID Connect login URL    https://HUB/hub/lti13/oauth_login
    Public JWK URL              https://HUB/hub/lti13/jwks

and copy the LMS's issuer, client id and endpoints below. The username the hub uses must be
the student id the roster (autograder/roster.csv) and nbgrader's exchange know the student by;
with LocalProcessSpawner it is also a Unix account, with KubeSpawner (coursehub/k8s/) it is
not.
"""

import os

c = get_config()  # noqa: F821

c.JupyterHub.authenticator_class = "ltiauthenticator.lti13.auth.LTI13Authenticator"
# the LMS (platform) this hub trusts: Canvas's values here; Moodle's are its own site URL's
c.LTI13Authenticator.issuer = os.environ.get("LTI13_ISSUER", "https://canvas.instructure.com")
c.LTI13Authenticator.client_id = {os.environ.get("LTI13_CLIENT_ID", "10000000000001")}
c.LTI13Authenticator.authorize_url = os.environ.get(
    "LTI13_AUTHORIZE_URL", "https://sso.canvaslms.com/api/lti/authorize_redirect"
)
c.LTI13Authenticator.jwks_endpoint = os.environ.get(
    "LTI13_JWKS_URL", "https://sso.canvaslms.com/api/lti/security/jwks"
)
# which launch claim becomes the hub's username: the LMS's login id, as the roster has it
c.LTI13Authenticator.username_key = os.environ.get("LTI13_USERNAME_KEY", "email")
# everyone the LMS launches into this course may log in; the LMS decides who that is
c.Authenticator.allow_all = True
