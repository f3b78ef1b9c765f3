// Package localproc runs a world of local worker processes, one per rank:
// it serves a rendezvous store on 127.0.0.1 for them to find each other,
// starts them so that they die with this process, streams rank 0's JSON
// lines to a callback, and ends the whole world when any rank fails.
//
// It is what `gpucoord train` and `gpucoord bench` use to run N ranks as N
// processes on one machine.
package localproc
