"""aleph.model"""
