"""What the operator is told: the providers config file, process settings from the
environment, and the tenancy rules.

Owns :mod:`app.config.providers` (the providers config; each type's block parsed by the parser
its provider type registers), :mod:`app.config.validation` (strict readers of user-written YAML
that name the file and field of a mistake), :mod:`app.config.cloud_fields` (readers the cloud
providers' blocks share), :mod:`app.config.settings` (environment
variables) and :mod:`app.config.tenancy` (which namespaces may use External Proxies and
cloud-init).  Plain data: must not import a provider package, the gateway or Redis.
"""
