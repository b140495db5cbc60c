"""Capacity: how full each target's engine is, from what a client sees and what servers say.

    own       the estimate from the prober's own requests (probes and load): queue wait,
              prefill baseline, slot occupancy, the drain rate; `QueueEstimator` combines
              every basis into one `Estimate`
    probes    the estimate from probes alone, the engine serving clients the prober never
              sees: waiting and running from the probes' waits and decode (`ProbesAloneEstimator`)
    decode    the decode slowdown a probe's gaps show (`DecodeModel`), and the slots learned
              from it where none are hinted
    inflight  the prober's own probes in flight (`ProbesInFlight`), counted on top
    server    the engine's own `/metrics` scraped and normalised (vLLM, llama-server, SGLang,
              TGI), the truth where an engine reports one
    target    `TargetCapacity`, one per target, fed finished requests and scraping its
              engine, and saying whose word the traffic's shape rests on (`traffic:`, the
              engine's counters, or nobody's: then no waiting depth); `CapacityCollector`
              exports both figures at scrape time

The basis an estimate rests on is `prober.kinds.Basis`. Everything above this package
(recording, the scheduler, the load driver, the daemon, bench) imports from its modules.
"""
