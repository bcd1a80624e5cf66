package main

import (
	"slices"
	"time"
)

// percentile of a sample (nearest rank); 0 for an empty one.
func percentile(sample []time.Duration, p float64) time.Duration {
	if len(sample) == 0 {
		return 0
	}
	s := slices.Clone(sample)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// median of per-run values.
func median(vals []float64) float64 {
	if len(vals) == 0 {
		return 0
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
