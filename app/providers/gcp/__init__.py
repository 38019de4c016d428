"""The gcp provider (google-cloud-compute); see docs/gcp-provider.md.

Modules: ``config`` (the ``gcp:`` block, pure), ``ids`` (provider IDs, zone choice, pure),
``wire`` (on-demand, redacted SDK wire logging, pure), ``classify`` (SDK errors -> taxonomy)
and ``provider`` (:class:`~app.providers.gcp.provider.GcpProvider`).  Only ``classify`` and
``provider`` import the SDK, so loading the providers config never does.
"""
