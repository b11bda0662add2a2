package operator

import (
	"sync"
	"time"
)

// queue hands keys to workers: a key added several times before a worker
// takes it is handed out once, and a key is never handed to two workers
// at once (one added while it is processed is handed out again after).
type queue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	order      []string
	dirty      map[string]bool
	processing map[string]bool
	closed     bool
}

func newQueue() *queue {
	q := &queue{dirty: map[string]bool{}, processing: map[string]bool{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *queue) add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dirty[key] || q.closed {
		return
	}
	q.dirty[key] = true
	if !q.processing[key] {
		q.order = append(q.order, key)
		q.cond.Signal()
	}
}

// addAfter adds key once d has passed; after close it does nothing.
func (q *queue) addAfter(key string, d time.Duration) {
	if d <= 0 {
		q.add(key)
		return
	}
	time.AfterFunc(d, func() { q.add(key) })
}

// get blocks until a key is ready; ok is false once the queue is closed.
func (q *queue) get() (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.order) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return "", false
	}
	key := q.order[0]
	q.order = q.order[1:]
	delete(q.dirty, key)
	q.processing[key] = true
	return key, true
}

// done marks key processed, handing it out again if it was added meanwhile.
func (q *queue) done(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, key)
	if q.dirty[key] {
		q.order = append(q.order, key)
		q.cond.Signal()
	}
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}
