"""aleph.eval"""
