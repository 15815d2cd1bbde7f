"""Half-open time intervals (minutes) and a calendar of bookings."""
