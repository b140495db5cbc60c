"""Closed-loop autoscaling experiment: a fleet of simulator replicas with sidecar probers, a
real Prometheus evaluating the shipped rules, and a controller implementing the HPA algorithm.

- `hpa`: the HorizontalPodAutoscaler's arithmetic, pure (desired count per metric, tolerance,
  largest metric, stabilisation windows, scaling policies);
- `policy`: triggers and behaviour read from a KEDA ScaledObject, time scaled;
- `trace`: the offered load over time (ramp, step, spike);
- `fleet`: replica processes (simulator + sidecar daemon), start-up delay, endpoints;
- `traffic`: the separate process that sends the trace's requests over ready replicas;
- `prometheus`: a real Prometheus with the shipped rules, windows time scaled;
- `experiment`: one policy run on one trace; `report`: figures, tables and plots.

`bench/autoscale.py` is the command line.
"""
