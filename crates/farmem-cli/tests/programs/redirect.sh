# A shell script that writes through descriptors of its choosing, as configure scripts do
# (`exec 5>>config.log`), while its heap (an array of 60,000 strings) is mostly far.
# Usage: bash redirect.sh DIR   (prints what it wrote and read back; same output every run)
set -eu
dir=$1
rm -f "$dir/log"
declare -a heap
for ((i = 0; i < 60000; i++)); do
    printf -v pad '%0200d' "$i"
    heap[i]="entry $i $pad"
done
exec 5>>"$dir/log"
echo "log opened" >&5
printf 'line one\nline two\n' >"$dir/in"
exec 6<"$dir/in"
read -r first <&6
echo "read: $first" >&5
exec 6<&-
for ((k = 3; k <= 9; k++)); do
    [ "$k" = 5 ] && continue
    eval "exec $k>\"\$dir/f$k\""
    echo "through $k: ${heap[k * 1000]:0:12}" >&"$k"
    eval "exec $k>&-"
done
{ echo "to stderr, into the log" >&2; } 2>&5
exec 7>&1
echo "stdout through 7" >&7
exec 7>&-
exec 5>&-
sum=0
for ((i = 0; i < 60000; i += 7)); do
    printf -v pad '%0200d' "$i"
    [ "${heap[i]}" = "entry $i $pad" ] || { echo "entry $i lost"; exit 1; }
    sum=$((sum + ${#heap[i]}))
done
echo "heap checked: $sum"
cat "$dir/log"
for ((k = 3; k <= 9; k++)); do
    [ "$k" = 5 ] || cat "$dir/f$k"
done
