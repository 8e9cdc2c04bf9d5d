"""`zero-train gpu-check`: the acceptance run that asserts (plan its runs, run them in few launches, check them)."""
