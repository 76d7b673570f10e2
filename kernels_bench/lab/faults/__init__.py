"""Fault and fuzz harnesses: ``signals`` (engines and the router SIGKILLed and SIGSTOPped
under load), ``telemetry_fuzz`` (the router's telemetry subscribers against garbage frames)."""
