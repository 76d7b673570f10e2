"""Admission: a client's request authenticated, decoded once into typed msgspec structs
(``bodies``, ``workflow``; every bad value a 400 naming the field), checked against the
served models' contexts and tokenized when the policy needs it (``admit``), and made the
core's ``RoutingRequest``."""
