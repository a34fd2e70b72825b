"""aleph.targets"""
