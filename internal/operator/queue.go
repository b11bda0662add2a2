package operator

import (
	"sync"
	"time"
)

// queue hands keys to workers: a key added several times before a worker
// takes it is handed out once, and a key is never handed to two workers
// at once (one added while it is processed is handed out again after).
// Keys that low reports as background work (a warm pool's own Sandboxes
// refilling it) wait behind all others and take at most lowMax workers,
// so a pool refill competes less with the claims being served.
type queue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	order      []string
	lowOrder   []string
	dirty      map[string]bool
	processing map[string]bool // key -> whether it is low priority
	lowRunning int
	closed     bool
	low        func(string) bool
	lowMax     int
}

func newQueue() *queue {
	q := &queue{dirty: map[string]bool{}, processing: map[string]bool{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *queue) isLow(key string) bool { return q.low != nil && q.low(key) }

func (q *queue) add(key string) {
	low := q.isLow(key) // before q.mu: low may take the operator's lock
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dirty[key] || q.closed {
		return
	}
	q.dirty[key] = true
	if _, busy := q.processing[key]; !busy {
		q.push(key, low)
	}
}

// push queues key; called with q.mu held.
func (q *queue) push(key string, low bool) {
	if low {
		q.lowOrder = append(q.lowOrder, key)
	} else {
		q.order = append(q.order, key)
	}
	q.cond.Signal()
}

// addAfter adds key once d has passed; after close it does nothing.
func (q *queue) addAfter(key string, d time.Duration) {
	if d <= 0 {
		q.add(key)
		return
	}
	time.AfterFunc(d, func() { q.add(key) })
}

func (q *queue) lowReady() bool {
	return len(q.lowOrder) > 0 && (q.lowMax <= 0 || q.lowRunning < q.lowMax)
}

// get blocks until a key is ready; ok is false once the queue is closed.
func (q *queue) get() (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.order) == 0 && !q.lowReady() && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return "", false
	}
	var key string
	low := len(q.order) == 0
	if low {
		key, q.lowOrder = q.lowOrder[0], q.lowOrder[1:]
		q.lowRunning++
	} else {
		key, q.order = q.order[0], q.order[1:]
	}
	delete(q.dirty, key)
	q.processing[key] = low
	return key, true
}

// done marks key processed, handing it out again if it was added meanwhile.
func (q *queue) done(key string) {
	low := q.isLow(key)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.processing[key] {
		q.lowRunning--
		if q.lowReady() {
			q.cond.Signal()
		}
	}
	delete(q.processing, key)
	if q.dirty[key] {
		q.push(key, low)
	}
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}
