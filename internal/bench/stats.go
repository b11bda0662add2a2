package bench

import (
	"math"
	"sort"
	"time"
)

// Summary is a latency distribution in milliseconds. Percentiles use the
// nearest-rank method: p99 of 100 samples is the 99th smallest.
type Summary struct {
	N    int     `json:"n"`
	Min  float64 `json:"min_ms"`
	P50  float64 `json:"p50_ms"`
	P95  float64 `json:"p95_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

// Summarize computes a Summary; it does not modify samples.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Summary{
		N:    len(s),
		Min:  ms(s[0]),
		P50:  ms(rank(s, 0.50)),
		P95:  ms(rank(s, 0.95)),
		P99:  ms(rank(s, 0.99)),
		Max:  ms(s[len(s)-1]),
		Mean: ms(sum / time.Duration(len(s))),
	}
}

// rank returns the nearest-rank p-quantile of sorted s (non-empty).
func rank(s []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(s)))) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

// P50 returns the median of samples (0 when empty).
func P50(samples []time.Duration) float64 { return Summarize(samples).P50 }

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

// medianFloat returns the median of xs (the lower middle for even counts).
func medianFloat(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[(len(s)-1)/2]
}
