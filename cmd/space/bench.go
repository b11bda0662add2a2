package main

import "fmt"

func runBench(args []string) error {
	return fmt.Errorf("space bench: not implemented yet")
}
