"""aleph.train"""
