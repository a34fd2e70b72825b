"""aleph.env"""
