"""Where each route's decision runs, and what Envoy needs to make it: placement, `jwt_authn`, the
claims and request-form rules (`rbac`), and the one error contract whatever the placement."""
