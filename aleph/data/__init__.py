"""aleph.data"""
