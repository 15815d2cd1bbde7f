"""pass@k and the Wilson interval, re-exported from their home c2/passk.py (below c2/rl, whose
held-out evaluation reports them too)."""

from c2.passk import Z95, pass_at_k, wilson_interval

__all__ = ["Z95", "pass_at_k", "wilson_interval"]
