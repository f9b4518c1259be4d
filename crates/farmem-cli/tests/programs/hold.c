/* Fill N MiB of heap with a pattern, print "filled", then check it over and over, a
 * millisecond apart, until killed (exit 1 and "BAD" on a mismatch). Usage: hold MIB */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>
// MiB of heap, filled, then checked in a loop for ever (prints "filled" once)
int main(int c,char**v){ size_t mib=atol(v[1]); size_t n=(mib<<20)/8; uint64_t*a=malloc(n*8);
 for(size_t i=0;i<n;i++) a[i]=i*2654435761u; printf("filled\n"); fflush(stdout);
 for(;;){ for(size_t i=0;i<n;i+=64) if(a[i]!=i*2654435761u){fprintf(stderr,"BAD\n");return 1;} usleep(1000);} }
