"""proxy-operator domain package: resources, config, providers, reconcile logic, health and leases.

Nothing in here needs a broker: processes (``workers``, ``watchers``, ``api``) are thin
shells around the functions defined in this package.
"""
