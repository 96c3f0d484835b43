"""vidgen/training"""
