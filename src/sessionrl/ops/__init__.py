"""Operating policies in production: the registry, routing, canary analysis, degradation, takeover, the loop.

- `registry`: policy versions with lineage and stages (candidate → canary → production → retired), and the
  operations log, in the session store;
- `routing`: which version serves a session (production, a canary's share, a pin), recorded in the session;
- `analysis`: A/B comparison of two versions over the sessions each served, and the canary check;
- `strategy`: the global `strategy_mode` switch (policy / rules / human) and the rule-based fallback;
- `takeover`: sessions parked for a person, resumed by the next step a person posts;
- `serving`: all of the above inside a service (the orchestrator's chooser and the gateway's backend);
- `loop`: the continuous cycle (feed → re-score → attribute → train → gate → register → canary).
"""
