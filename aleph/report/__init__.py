"""aleph.report"""
