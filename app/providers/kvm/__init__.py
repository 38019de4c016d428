"""The kvm provider (libvirt-python over paramiko SSH).  Import the SDKs only inside the provider modules."""
