"""The aws provider: EC2 instances through boto3 (boto3 is imported only inside this package).

Modules: ``config`` (the ``aws:`` block), ``registration`` (the type), ``provider`` (the
contract), ``classify`` (errors), ``bootstrap`` (user-data), ``ids`` (provider IDs, zones,
client tokens), ``wire`` (redacted request logging).
"""
