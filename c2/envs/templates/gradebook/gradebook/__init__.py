"""Course grades: weighted averages, letters, curves and rankings."""
