"""The gcp provider (google-cloud-compute).  Import the SDK only inside ``provider.py``."""
